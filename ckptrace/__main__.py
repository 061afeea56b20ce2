"""Allow `python -m ckptrace`."""
from ckptrace.cli import main

main()
