"""The one option table and the records parsed from it."""
