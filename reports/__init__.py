"""Render a Diagnosis (terminal text, JSON; HTML in a later issue). Renders, never computes."""
