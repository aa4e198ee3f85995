"""Operating the layer: the doctor, retention, audited replay of dead letters."""
