"""The documentation site's generated reference pages, one module per page (or two small ones):
devtools/docs_reference.py names them and writes or checks docs/reference/*.md."""
