import sys

from worker.cli import main

if __name__ == "__main__":  # vLLM's spawned workers re-import the main module: start nothing on import
    sys.exit(main())
