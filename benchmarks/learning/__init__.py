"""What the scripts learn: returns and curves beside the published figures or a peer's on the same budget."""
