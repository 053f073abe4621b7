"""The parts of the queue state machine; `QueueMachine` itself is in node/core/machine.py, whose
docstring maps the modules here."""
