"""Runnable, tested examples of using the layer from web apps."""
