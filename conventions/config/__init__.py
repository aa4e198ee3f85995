"""The layer's settings and the one reliable profile to adopt."""
