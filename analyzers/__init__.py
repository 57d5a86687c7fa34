"""Pure analyses: trace columns in, dataclasses out. Nothing here touches hardware."""
