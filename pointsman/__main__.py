"""``python -m pointsman`` runs the CLI."""

from pointsman.service.cli import main

if __name__ == "__main__":
    main()
