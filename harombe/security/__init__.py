"""Sandboxes, their Docker seam, and the policy that guards them."""
