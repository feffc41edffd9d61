"""Local training inside silos: batch sampling and DP-SGD."""
