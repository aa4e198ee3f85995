"""The console's pages, one module each: its routes (``ROUTES``) and its handlers."""
