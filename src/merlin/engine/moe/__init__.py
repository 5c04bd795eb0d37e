"""Mixture-of-experts decoder layers (Qwen3-VL-30B-A3B, Qwen3-30B-A3B): config keys, expert
weights (loading, quantizing, the weight cache's form) and the routed MLP's forward."""
