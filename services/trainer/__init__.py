"""The trainer service: forward/backward, optimizer steps, LoRA and full fine-tuning,
publishing weights to modelstate."""
