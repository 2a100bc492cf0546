"""Measurement: held-out evaluation (greedy and sampled), statistics with intervals, attribution of a
change to its cause, the reference run's fixed tests, and the CPU profiler."""
