"""Where the shipped data lives (the repository's `data/` folder, next to the packages)."""
from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
CATALOG_DIR = DATA_DIR / "catalog"
MODELS_DIR = DATA_DIR / "models"
SCENARIOS_DIR = DATA_DIR / "scenarios"
VALIDATION_DIR = DATA_DIR / "validation"
CALIBRATION_DIR = DATA_DIR / "calibration"
