"""The built-in plug-ins: agents, environments, tools and the embedded tasks.

Written against `realhf.api` as a user's own would, and found the same way: by the names the
registries in `realhf.api.agent`, `realhf.api.env` and `realhf.api.tools` map to import paths.
Nothing in `realhf.impl` or `realhf.system` imports this package (tests/checks/test_import_layers.py).
"""
