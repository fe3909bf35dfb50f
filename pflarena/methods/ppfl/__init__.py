"""PPFL: its parameters (:mod:`.params`)."""
