"""The feed meter (``--feed-report``): how long a rank's training loop waits for its DataLoader (docs/tune.md)."""
