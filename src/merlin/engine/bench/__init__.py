"""`python -m merlin.engine.bench`: figures as ratios against what this machine does in the same
run."""
