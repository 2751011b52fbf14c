from agentbox.cli.main import main

main()
