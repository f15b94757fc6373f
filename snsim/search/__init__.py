"""Capacity searches (``snsim search``): torch-free probe traces, doubling and bisection."""
