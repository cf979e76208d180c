"""sft.py: not implemented yet (see the issues)."""
if __name__ == "__main__":
    raise SystemExit("sft.py: not implemented yet")
