"""The hardware catalog: required names, facts carried over from the research, merging, errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from partita.cli import main
from partita.planner.catalog import load_catalog, local_catalog_path
from partita.planner.catalog_schema import source_list
from partita.planner.documents import Checker
from partita.planner.errors import PartitaError
from partita.planner.scenario import ClusterSpec

# The research notes sit beside the checkout (../shared/research; a worktree is deeper): the
# nearest ancestor that has them, or None (the test that reads them skips).
RESEARCH = next((d / "shared" / "research" / "hardware_catalog.yaml"
                 for d in Path(__file__).resolve().parents
                 if (d / "shared" / "research" / "hardware_catalog.yaml").is_file()), None)
REQUIRED_GPUS = ("k80", "t4", "v100-16gb", "v100-32gb", "a10g", "a100-40gb", "a100-80gb", "h100-80gb",
                 "h200-141gb")
REQUIRED_AWS = ("g4dn.xlarge", "g4dn.12xlarge", "g4dn.metal", "p2.xlarge", "p2.8xlarge", "p2.16xlarge",
                "p3.2xlarge", "p3.8xlarge", "p3.16xlarge", "p3dn.24xlarge", "p4d.24xlarge",
                "p4de.24xlarge", "p5.48xlarge", "p5e.48xlarge", "p5en.48xlarge", "g5.48xlarge")
REQUIRED_ONPREM = ("dgx1-v100", "dgx2-v100", "dgx-a100-40gb", "dgx-a100-80gb", "dgx-h100", "hgx-h200")
# research ids -> catalog names
RESEARCH_GPU = {"k80_gk210": "k80", "m60_gm204": "m60", "t4": "t4", "v100_sxm2_16gb": "v100-16gb",
                "v100_sxm2_32gb": "v100-32gb", "a10g": "a10g", "a100_sxm4_40gb": "a100-40gb",
                "a100_sxm4_80gb": "a100-80gb", "h100_sxm5_80gb": "h100-80gb",
                "h200_sxm_141gb": "h200-141gb", "l4": "l4", "l40s": "l40s", "b200": "b200"}


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    """No ~/.partita/local.yaml or $PARTITA_CATALOG of the machine leaks into a test."""
    monkeypatch.setenv("PARTITA_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PARTITA_CATALOG", raising=False)


@pytest.fixture
def catalog():
    return load_catalog()


def write(tmp_path: Path, doc, name: str = "user.yaml") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


def test_every_required_name_loads(catalog):
    for name in REQUIRED_GPUS:
        assert catalog.gpu(name).name == name
    for name in REQUIRED_AWS + REQUIRED_ONPREM:
        system = catalog.system(name)
        assert system.gpus_per_node >= 1 and system.gpu.name in catalog.gpu_names()
    for name in REQUIRED_AWS:
        assert catalog.system(f"ml.{name}").kind == "sagemaker"


def test_headline_numbers(catalog):
    assert catalog.gpu("h100-80gb").peak("bf16") == 989e12
    assert catalog.gpu("h100-80gb").peak("fp8") == 1979e12
    assert catalog.gpu("a100-40gb").nvlink_bytes_per_s == 300e9
    assert catalog.gpu("a100-80gb").memory_bytes == 80 * 2 ** 30
    p4d = catalog.system("p4d.24xlarge")
    assert (p4d.inter.kind, p4d.inter.nics, p4d.inter.bytes_per_s) == ("efa", 4, 50e9)
    assert p4d.inter.gpudirect_rdma and p4d.intra.bytes_per_s == 300e9
    p5 = catalog.system("p5.48xlarge")
    assert p5.inter.bytes_per_s * 8 / 1e9 == pytest.approx(3200)
    assert catalog.system("p5en.48xlarge").inter.bytes_per_s == p5.inter.bytes_per_s   # 16 x 200
    cube = catalog.system("p3.16xlarge").intra
    assert (cube.kind, cube.bytes_per_s) == ("nvlink-cube-mesh", 150e9)


def test_onprem_headlines_match_the_contract(catalog):
    expect = {"dgx1-v100": ("v100-16gb", 8, "nvlink-cube-mesh", 4, 100),
              "dgx2-v100": ("v100-32gb", 16, "nvswitch", 8, 100),
              "dgx-a100-40gb": ("a100-40gb", 8, "nvswitch", 8, 200),
              "dgx-a100-80gb": ("a100-80gb", 8, "nvswitch", 8, 200),
              "dgx-h100": ("h100-80gb", 8, "nvswitch", 8, 400),
              "hgx-h200": ("h200-141gb", 8, "nvswitch", 8, 400)}
    for name, (gpu, per_node, fabric, nics, gbps) in expect.items():
        s = catalog.system(name)
        assert (s.gpu.name, s.gpus_per_node, s.intra.kind, s.inter.nics) == (gpu, per_node, fabric, nics)
        assert s.inter.bytes_per_s == pytest.approx(nics * gbps * 1e9 / 8)
        assert s.kind == "onprem" and s.price.best_usd_per_hour is None


def test_precision_support(catalog):
    t4, v100, k80 = catalog.gpu("t4"), catalog.gpu("v100-16gb"), catalog.gpu("k80")
    assert t4.supports("fp16") and not t4.supports("bf16") and not t4.supports("tf32")
    assert v100.supports("fp16") and not v100.supports("bf16") and not v100.supports("tf32")
    assert list(k80.peak_flops) == ["fp32"]
    with pytest.raises(PartitaError, match="'bf16' is not supported by t4"):
        t4.peak("bf16")


def test_a10g_falls_back_to_measured_matmul(catalog):
    a10g = catalog.gpu("a10g")
    assert a10g.datasheet_flops["bf16"] is None
    assert a10g.peak("bf16") == 69.5e12 and a10g.peak("fp32") == 23.4e12
    assert a10g.peak_is_measured("bf16") and "ZZC_126" in a10g.source
    assert "measured matmul" in a10g.notes
    with pytest.raises(PartitaError, match="no FLOP/s figure for fp16 on a10g"):
        a10g.peak("fp16")
    assert not catalog.gpu("h100-80gb").peak_is_measured("bf16")


def test_sagemaker_names_carry_the_ml_price(catalog):
    ml = catalog.system("ml.p4d.24xlarge")
    assert ml.kind == "sagemaker" and ml.price.on_demand_usd_per_hour == 37.688
    assert ml.gpu == catalog.system("p4d.24xlarge").gpu and ml.inter == catalog.system("p4d.24xlarge").inter
    assert ml.price.date == "before 2025-06"
    assert catalog.system("ml.p5e.48xlarge").price.on_demand_usd_per_hour is None
    assert catalog.system("p4d.24xlarge").price.on_demand_usd_per_hour == 21.957642
    with pytest.raises(PartitaError, match="unknown system 'ml.dgx-h100'"):
        catalog.system("ml.dgx-h100")       # on-prem hardware has no SageMaker twin
    assert "ml.p4d.24xlarge" in catalog.system_names(sagemaker=True)
    assert "ml.p4d.24xlarge" not in catalog.system_names()


def test_every_source_resolves(catalog):
    sources = catalog.sources()
    for name in catalog.gpu_names() + catalog.system_names():
        info = catalog.describe(name)
        assert source_list(Checker(info["entry"], "", ""), required=True)
        for key, citation in info["sources"].items():
            assert key in sources and citation, f"{name}: source {key!r} not in sources.yaml"


def test_facts_carry_over_from_the_research(catalog):
    research = yaml.safe_load(RESEARCH.read_text()) if RESEARCH else pytest.skip("no research")
    for r in research["gpus"]:
        if r["id"] not in RESEARCH_GPU:
            continue
        g = catalog.gpu(RESEARCH_GPU[r["id"]])
        assert g.memory_bytes == r["memory_gb"] * 2 ** 30
        assert g.memory_bandwidth_bytes_per_s == r["mem_bw_GBps"] * 1e9
        assert g.datasheet_flops.get("fp32") == _tera(r["fp32_tflops"])
        assert g.datasheet_flops.get("fp8") == _tera(r["fp8_tflops"])
        tensor = g.datasheet_flops.get("bf16", g.datasheet_flops.get("fp16"))
        assert tensor == _tera(r["fp16_bf16_tensor_tflops"]), g.name
        assert g.nvlink_bytes_per_s == _giga(r["nvlink_bw_unidir_GBps"])
    for r in research["instances"]:
        if r.get("gpu_type") is None or r["name"] not in catalog.system_names():
            continue
        s = catalog.system(r["name"])
        expect = (RESEARCH_GPU[r["gpu_type"]], r["gpu_count"], r["vcpus"])
        assert (s.gpu.name, s.gpus_per_node, s.vcpus) == expect
        assert s.host_memory_bytes == r["host_memory_gib"] * 2 ** 30
        gbps = r["network_gbps"]
        assert s.inter.bytes_per_s == (None if gbps is None else pytest.approx(gbps / 8 * 1e9))
        assert s.price.on_demand_usd_per_hour == r["price_on_demand_usd_hr"]
        assert s.price.sagemaker_usd_per_hour == r["price_sagemaker_ml_usd_hr"]


def _tera(v):
    return None if v is None else v * 1e12


def _giga(v):
    return None if v is None else v * 1e9


def test_user_file_merges_field_by_field(tmp_path):
    path = write(tmp_path, {
        "sources": {"MY_QUOTE": "reseller quote 2026-02"},
        "gpus": [{"name": "h100-80gb", "peak_dense_tflops": {"bf16": 900}}],
        "systems": [
            {"name": "p4d.24xlarge", "price": {"on_demand_usd_per_hour": 12.5, "source": ["MY_QUOTE"]}},
            {"name": "my-box", "kind": "onprem", "gpu": "a100-80gb", "gpus_per_node": 4,
             "intra_node": {"kind": "nvlink", "unidir_GBps": 300}, "inter_node": {"kind": "none"},
             "source": ["MY_QUOTE"]}]})
    shipped, merged = load_catalog(), load_catalog(path)
    p4d, old = merged.system("p4d.24xlarge"), shipped.system("p4d.24xlarge")
    assert p4d.price.on_demand_usd_per_hour == 12.5 and p4d.price.region == "us-east-1"
    assert p4d.price.sagemaker_usd_per_hour == 37.688 and p4d.price.source == ("MY_QUOTE",)
    assert (p4d.gpu, p4d.inter, p4d.intra) == (old.gpu, old.inter, old.intra)
    assert merged.gpu("h100-80gb").peak("bf16") == 900e12
    assert merged.gpu("h100-80gb").peak("fp8") == 1979e12
    assert merged.system("p5.48xlarge").gpu.peak("bf16") == 900e12   # systems see the new GPU
    box = merged.system("my-box")
    assert box.inter.bytes_per_s is None and box.intra.bytes_per_s == 300e9
    assert merged.describe("my-box")["sources"]["MY_QUOTE"] == "reseller quote 2026-02"
    assert shipped.system("p4d.24xlarge").price.on_demand_usd_per_hour == 21.957642


def test_local_file_is_read_and_extra_wins(tmp_path, monkeypatch):
    home = tmp_path / "phome"
    monkeypatch.setenv("PARTITA_HOME", str(home))
    assert local_catalog_path() == home / "local.yaml"
    home.mkdir()
    write(home, """
gpus:
  - {name: local-cpu, memory_gib: 3.5, mem_bw_GBps: 12, measured_matmul_tflops: {fp32: 0.05},
     source: "partita calibrate 2026-03-01 on box"}
systems:
  - name: local
    kind: local
    gpu: local-cpu
    gpus_per_node: 2
    intra_node: {kind: host, unidir_GBps: 2.5, latency_us: 40}
    inter_node: {kind: none}
    price: {date: 2026-03-01}
    source: "partita calibrate 2026-03-01 on box"
""", "local.yaml")
    local = load_catalog().system("local")
    assert local.gpu.peak("fp32") == 0.05e12 and local.intra.latency_s == pytest.approx(40e-6)
    assert local.price.date == "2026-03-01"          # an unquoted YAML date is kept as text
    assert load_catalog().describe("local")["sources"] == {"partita calibrate 2026-03-01 on box": None}
    extra = write(tmp_path, {"systems": [{"name": "local", "gpus_per_node": 1}]})
    assert load_catalog(extra).system("local").gpus_per_node == 1


def test_resolve_cluster_applies_what_ifs_and_needs_known_bandwidth(catalog):
    hw = catalog.resolve_cluster(ClusterSpec(system="p4d.24xlarge", gpus=64))
    assert (hw.nodes, hw.gpus) == (8, 64)
    hw = catalog.resolve_cluster(ClusterSpec(system="p4d.24xlarge", nodes=2, inter_node_gbps=800))
    assert hw.gpus == 16 and hw.system.inter.bytes_per_s == 100e9
    with pytest.raises(PartitaError, match="set cluster.intra_node_gbps"):
        catalog.resolve_cluster(ClusterSpec(system="g5.48xlarge", gpus=8), origin="s.yaml")
    hw = catalog.resolve_cluster(ClusterSpec(system="g5.48xlarge", gpus=8, intra_node_gbps=128))
    assert hw.system.intra.bytes_per_s == 16e9
    assert catalog.resolve_cluster(ClusterSpec(system="g5.48xlarge", gpus=1)).nodes == 1
    with pytest.raises(PartitaError, match="set cluster.inter_node_gbps"):
        catalog.resolve_cluster(ClusterSpec(system="p2.xlarge", nodes=2))
    with pytest.raises(PartitaError, match="set cluster.intra_node_gbps"):
        catalog.resolve_cluster(ClusterSpec(system="p3.2xlarge", gpus=4, gpus_per_node=4))


def test_catalog_is_deterministic_and_cached(tmp_path):
    a, b = load_catalog(), load_catalog()
    assert a is b and a.describe("p5.48xlarge") == b.describe("p5.48xlarge")


def test_cli_list_and_show(capsys):
    assert main(["catalog", "list"]) == 0
    out = capsys.readouterr().out
    for name in REQUIRED_GPUS + REQUIRED_AWS + REQUIRED_ONPREM:
        assert name in out
    assert "69.5* bf16" in out                       # the A10G's measured figure is marked
    assert main(["catalog", "list", "--systems", "--sagemaker", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert set(rows) == {"systems"}
    ml = next(r for r in rows["systems"] if r["name"] == "ml.p4d.24xlarge")
    assert ml["usd_per_hour"] == 37.688 and ml["inter_node"]["gbps"] == pytest.approx(400)
    assert main(["catalog", "list", "--gpus", "--json"]) == 0
    gpus = {r["name"]: r for r in json.loads(capsys.readouterr().out)["gpus"]}
    assert gpus["h100-80gb"]["peak_tflops"]["bf16"] == 989
    assert gpus["a10g"]["measured"] == ["fp32", "tf32", "bf16"]
    assert main(["catalog", "show", "p4d.24xlarge"]) == 0
    out = capsys.readouterr().out
    assert "inter_node.nic_gbps: 100" in out and "P4D_BLOG: https://" in out
    assert "bytes_per_s: 50000000000.0" in out
    assert main(["catalog", "show", "H100-80GB", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["si"]["peak_flops"]["bf16"] == 989e12 and "MLE_ACC" in info["sources"]


def test_cli_user_catalog_option_and_env(tmp_path, capsys, monkeypatch):
    path = write(tmp_path, {"systems": [{"name": "p5.48xlarge", "price": {"on_demand_usd_per_hour": 1.5}}]})
    assert main(["catalog", "show", "p5.48xlarge", "--json", "--catalog", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["si"]["price_usd_per_hour"] == 1.5
    monkeypatch.setenv("PARTITA_CATALOG", str(path))
    assert main(["catalog", "show", "p5.48xlarge", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["si"]["price_usd_per_hour"] == 1.5


NEW_BOX = {"name": "box", "kind": "onprem", "gpu": "a100-80gb", "gpus_per_node": 8,
           "intra_node": {"kind": "nvswitch", "unidir_GBps": 300}, "inter_node": {"kind": "none"},
           "source": "ours"}


def _with(**changes):
    return {**NEW_BOX, **changes}


BAD_FILES = [
    ({"systems": [{"name": "p4d.24xlarge"}, {"name": "p5.48xlarge"},
                  {"name": "p2.xlarge", "gpus_per_node": "eight"}]},
     "user.yaml: systems[2].gpus_per_node: expected an integer, got 'eight'"),
    ({"systems": [{"name": "p4d.24xlarge", "gpus_per_nod": 8}]},
     "systems[0].gpus_per_nod: unknown key; did you mean 'gpus_per_node'?"),
    ({"systems": [{"name": "p4d.24xlarge", "price": {"on_demand_usd_per_hr": 3}}]},
     "systems[0].price.on_demand_usd_per_hr: unknown key; did you mean 'on_demand_usd_per_hour'?"),
    ({"systems": [_with(gpu="a100")]}, "systems[0].gpu: unknown GPU 'a100'; did you mean"),
    ({"system": []}, "user.yaml: system: unknown key; did you mean 'systems'?"),
    ({"systems": {"name": "box"}}, "user.yaml: systems: expected a list of entries"),
    ({"systems": [{k: v for k, v in NEW_BOX.items() if k != "intra_node"}]},
     "systems[0].intra_node: missing required section"),
    ({"systems": [{k: v for k, v in NEW_BOX.items() if k != "source"}]},
     "systems[0].source: missing required key"),
    ({"systems": [_with(kind="colo")]}, "systems[0].kind: expected one of cloud, onprem, local, got 'colo'"),
    ({"systems": [_with(name="ml.box")]}, "systems[0].name: 'ml.' names are derived"),
    ({"systems": [_with(gpus_per_node=2, intra_node={"kind": "none"})]},
     "systems[0].intra_node.kind: kind none (no GPU-to-GPU link) needs gpus_per_node 1, got 2"),
    ({"systems": [_with(inter_node={"kind": "efa", "nics": 0, "nic_gbps": 100})]},
     "systems[0].inter_node.nics: kind efa needs at least one NIC"),
    ({"systems": [_with(name="t4")]}, "systems[0].name: 't4' is already a GPU name"),
    ({"gpus": [{"name": "x1", "memory_gib": 8, "mem_bw_GBps": 100, "peak_dense_tflops": {"bf16": None},
                "source": "s"}]}, "gpus[0]: no FLOP/s figure"),
    ({"gpus": [{"name": "x1", "memory_gib": 8, "mem_bw_GBps": -1, "peak_dense_tflops": {"fp32": 1},
                "source": "s"}]}, "gpus[0].mem_bw_GBps: must be > 0, got -1"),
    ({"gpus": [{"name": "x1", "memory_gib": 8, "mem_bw_GBps": 1, "peak_dense_tflops": {"fp64": 1}}]},
     "gpus[0].peak_dense_tflops.fp64: unknown key"),
    ("systems: [ {name: p4d", "user.yaml: invalid YAML"),
    ("- just\n- a list\n", "user.yaml: expected a mapping at the top level"),
]


@pytest.mark.parametrize("doc, message", BAD_FILES)
def test_bad_user_files_give_one_error_line(tmp_path, capsys, doc, message):
    path = write(tmp_path, doc)
    assert main(["catalog", "list", "--catalog", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err


@pytest.mark.parametrize("argv, message", [
    (["catalog", "show", "p4d.24xl"],
     "error: unknown system or GPU 'p4d.24xl'; did you mean 'p4d.24xlarge'?\n"),
    (["catalog", "show", "zzzz"], "error: unknown system or GPU 'zzzz' (see `partita catalog list`)\n"),
    (["catalog", "list", "--catalog", "no/such/file.yaml"], "error: no/such/file.yaml: no such file"),
])
def test_cli_errors(capsys, argv, message):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_missing_file_from_environment(capsys, monkeypatch):
    monkeypatch.setenv("PARTITA_CATALOG", "/nonexistent/cat.yaml")
    assert main(["catalog", "list"]) == 1
    assert capsys.readouterr().err == "error: /nonexistent/cat.yaml: no such file (a catalog file: " \
        "YAML or JSON with gpus:/systems:)\n"


def test_unknown_gpu_lookup_suggests(catalog):
    with pytest.raises(PartitaError, match=r"unknown GPU 'a100'; did you mean 'a100-40gb', 'a100-80gb'"):
        catalog.gpu("a100")


HX_GPU = {"name": "hx-gpu", "memory_gib": 16, "mem_bw_GBps": 900, "peak_dense_tflops": {"bf16": 120},
          "source": ["test"]}


@pytest.mark.parametrize("key, value, message", [
    ("peak_dense_tflops", {"bf16": 1.0e300}, "gpus[0].peak_dense_tflops.bf16: must be <= 1e+06"),
    ("memory_gib", 1.0e-12, "gpus[0].memory_gib: must be >= 0.125, got 1e-12"),
    ("mem_bw_GBps", float("inf"), "gpus[0].mem_bw_GBps: expected a number, got inf"),
    ("pcie_unidir_GBps", -3, "gpus[0].pcie_unidir_GBps: must be > 0, got -3"),
])
def test_numbers_outside_their_range_are_named(tmp_path, key, value, message):
    path = write(tmp_path, {"gpus": [{**HX_GPU, key: value}]})
    with pytest.raises(PartitaError) as exc:
        load_catalog(path)
    assert str(exc.value) == f"{path}: {message}" or str(exc.value).startswith(f"{path}: {message}")


def test_a_name_twice_in_one_file_is_an_error_not_a_merge(tmp_path):
    path = write(tmp_path, {"gpus": [HX_GPU, {**HX_GPU, "name": "HX-GPU", "memory_gib": 80}]})
    with pytest.raises(PartitaError, match=r"gpus\[1\].name: 'HX-GPU' is also gpus\[0\] of this file"):
        load_catalog(path)


def test_unknown_system_names_the_scenario_key(tmp_path, capsys):
    scenario = write(tmp_path, {"model": {"preset": "gpt2"}, "cluster": {"system": "p4d.24xlarg", "gpus": 8},
                                "training": {"global_batch": 8}, "parallel": {"data": 8}}, "s.yaml")
    assert main(["simulate", str(scenario)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {scenario}: cluster.system: unknown system 'p4d.24xlarg'; did you mean")


def test_every_gpu_has_a_family_and_sizes_of_one_part_share_it(catalog):
    gpus = {n: catalog.gpu(n) for n in catalog.gpu_names()}
    assert all(g.family for g in gpus.values())
    assert gpus["a100-40gb"].family == gpus["a100-80gb"].family == "a100"
    assert gpus["v100-16gb"].family == gpus["v100-32gb"].family == "v100"
    assert gpus["h100-80gb"].family == "h100" and gpus["h200-141gb"].family == "h200"


def test_user_gpu_family_is_optional_and_checked(tmp_path):
    gpu = {"name": "my-gpu", "memory_gib": 24, "mem_bw_GBps": 900, "peak_dense_tflops": {"bf16": 100},
           "source": ["datasheet"]}
    assert load_catalog(write(tmp_path, {"gpus": [gpu]})).gpu("my-gpu").family is None
    assert load_catalog(write(tmp_path, {"gpus": [dict(gpu, family="h100")]}, "b.yaml")) \
        .gpu("my-gpu").family == "h100"
    with pytest.raises(PartitaError, match=r"gpus\[0\]\.family: expected a lowercase key"):
        load_catalog(write(tmp_path, {"gpus": [dict(gpu, family="H 100")]}, "c.yaml"))


def test_local_before_calibration_says_how_to_get_it():
    from partita.planner.catalog import load_catalog
    with pytest.raises(PartitaError, match=r"unknown system 'local': this machine is not "
                                           r"calibrated; run `partita calibrate`"):
        load_catalog().system("local")
