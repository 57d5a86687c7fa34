"""Render a Diagnosis: terminal text, self-contained HTML, JSON. Renders, never computes."""
