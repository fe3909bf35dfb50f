"""SplitGP: its parameters (:mod:`.params`)."""
