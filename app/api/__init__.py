"""HTTP surfaces, one router per resource."""
