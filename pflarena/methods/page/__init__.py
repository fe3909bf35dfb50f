"""PAGE: its parameters (:mod:`.params`)."""
