"""``python -m pointsman`` runs the CLI."""

from pointsman.cli.main import main

if __name__ == "__main__":
    main()
