"""Everything that touches hardware or a live process."""
