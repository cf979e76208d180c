"""train.py: not implemented yet (see the issues)."""
if __name__ == "__main__":
    raise SystemExit("train.py: not implemented yet")
