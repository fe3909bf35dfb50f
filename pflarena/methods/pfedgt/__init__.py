"""pFedGT: its parameters (:mod:`.params`)."""
