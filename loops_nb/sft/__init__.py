"""Supervised fine-tuning: data contracts, the target rule, check and training."""
