from tracegraph.cli.app import main

main()
