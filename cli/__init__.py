"""The ``pointsman`` command line (click). Imports every other package; imported by none."""
