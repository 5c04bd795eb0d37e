"""`python -m engine.bench`: figures as ratios against what this machine does in the same run."""
