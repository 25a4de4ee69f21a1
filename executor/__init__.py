"""Executing a scenario's plan for real: `partita run` under torchrun (torch.distributed).

- plan.py      what every rank does (degrees, chunks, micro-batching), checked before launch; no torch
- preflight.py what `partita run` checks before launch (placement, memory, outputs, checkpoints)
              and the simulator's prediction it records; no torch
- launch.py    the torchrun command line, the job file, rank 0's result; no torch
- worker.py    `python -m partita.executor.worker`: one rank (process group, then train.run_rank)
- train.py     the per-rank training loop and the single-process reference it must match
- stages.py    this rank's model chunks, cut from planner.models or a `module:` model; tied parameters
- parallel.py  device mesh, tensor and sequence parallelism, data parallelism (ZeRO 0-3), reductions
- precision.py dynamic loss scaling for fp16 (bf16 and fp16 autocast live in stages.Chunk)
- data.py      synthetic or file token batches, a pure function of the sample index
- measure.py   step times, tokens/s, peak memory, per-action and P2P spans; metrics.jsonl, trace.json
- checkpoint.py, faults.py: checkpoints, fault injection
- measure_machine.py, machine_files.py: `partita calibrate` measures this machine and writes its
  catalog entry and calibration overlay

Nothing here is imported by the planner or the simulator.
"""
