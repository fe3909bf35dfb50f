"""Fed-ROD: its parameters (:mod:`.params`)."""
