"""machinery: what makes the root scripts fast or safe, not what they compute. Read the root first.

A floor of leaves: nothing here imports the root or data/ (what a module must hash, load or call is handed in by
its caller), and the sandbox's program (zygote*.py) imports only itself, since a zygote runs it alone;
tests/test_imports.py checks both. docs/architecture.md lists each module, what it holds and the one place in the
root that calls it, so that a reader of the algorithm can skip it.
"""
