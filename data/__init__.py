"""Data layer: JSONL problem sets (problems.py), the synthetic demo (synth.py), downloads (download.py), models (models.py)."""
