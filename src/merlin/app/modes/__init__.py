"""Ways to run the app other than interactively: self-test, screenshots, scripted runs."""
