"""Caption scores that need neither torch nor Java."""
