from tracegraph.cli.entry import main

main()
