"""The bodies of the ``hf-spec`` commands (:mod:`hf_spec.cli` holds the parser and the dispatch): one
``run`` function per command, raising ``ValueError`` for bad input, which the CLI prints as one line."""
