from consumers.cli import main

main()
