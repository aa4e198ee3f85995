"""The how-to guides' code as real modules: ``docs/howto/*.md`` show them verbatim.

``tests/unit/test_docs_examples.py`` checks that each marked code block of a how-to is
this file (or a verbatim part of it), and imports and runs these modules.
"""
