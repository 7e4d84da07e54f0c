"""The environment as an HTTP service (``seal serve``) and its client."""
