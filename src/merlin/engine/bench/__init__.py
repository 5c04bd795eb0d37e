"""`python -m merlin.engine.bench`: every benchmark of the engine, as sections of one entry
(see __main__.py); figures as ratios against what this machine does in the same run."""
