from kdt.cli import main

main()
