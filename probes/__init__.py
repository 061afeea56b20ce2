"""Kernel side: symbol resolution, BPF programs and the recorder that loads them (needs bcc and root)."""
