"""Hub: a model's bytes, proven: sources (Hugging Face, ModelScope, local folders under the
operator's roots), credentials and endpoints, the streaming verifying transfer, the repo
contract, metadata headers without weights, and the disk-space check before a byte lands.

May import: the package's base modules (errors, paths, fileio, safety, config) and
``sizing`` (dtype sizes and the bounded config reader). Never serving, evaluation, decision,
canary or reporting.
"""
