"""bridge-freeze-plugin."""
