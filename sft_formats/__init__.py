"""The reasoning formats of the SFT warm start (sft.py): `completions`."""
