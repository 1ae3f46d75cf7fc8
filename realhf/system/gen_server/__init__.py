"""The generation server: the built-in engine behind SGLang's HTTP protocol."""
