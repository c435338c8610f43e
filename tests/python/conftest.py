import os
import sys

# Test bodies are imported by name in the rank processes (forkserver or spawn): keep this folder importable.
sys.path.insert(0, os.path.dirname(__file__))
