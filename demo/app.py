"""The hf-spec Gradio demo: ``python demo/app.py [--target NAME --draft NAME --medusa DIR --port 7860]``.

The same as ``hf-spec demo``; the app itself is ``hf_spec.demo`` (installed with the package).
"""

import sys

from hf_spec.demo import main

if __name__ == "__main__":
    sys.exit(main())
