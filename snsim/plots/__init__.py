"""Plots (matplotlib, Agg backend).  Colour and marker per policy live in ``style``."""
